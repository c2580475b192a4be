#!/usr/bin/env python3
"""Side-by-side timings, measured in one run on this machine.

    make bench            (or: python3 bench/bench.py [--runs N])

Each row runs the same workload N times and reports p50/p95 wall time and the
ratio of its p50 to the baseline's: the rootfs's own Python with no isolation
(`chroot ROOTFS /opt/py/bin/python`). sandboxd rows go through the real HTTP API
(a keep-alive http.client connection), so they include HTTP, the fresh namespaces,
cgroup, Landlock and seccomp, the workspace scan for artifacts and the result.

Two daemons run side by side: one with the pool off (`--pool-size 0`: every run
builds a cold sandbox) and one with the default pool. The systems of a workload
are measured in rounds, one run of each per round, so that whatever else the
machine does weighs on all alike; a round starts, untimed, once the pool is full,
and its pooled run comes last, so it finds a ready sandbox and its refill overlaps
no other run. The throughput rows keep 8 clients busy against each daemon; the
pooled daemon's runs queue briefly for a template coming back from its last run,
or fall back to cold sandboxes, and its row says how many runs per second its
templates served.

    python3 bench/bench.py --packages

measures package installs instead (the package index must be reachable): one small
pure-Python wheel installed by plain `pip install` in the rootfs's Python without
isolation (the baseline), by sandboxd into a new session with the package cache off
(a first install) and into a new session whose install the cache serves (a second
one), and `import` of the installed package in a cold and in a pooled run.

    python3 bench/bench.py --vs OTHER/target/release/sandboxd

compares two builds of the daemon (say, main and the commit before a change) in the
same rounds: each sandboxd row is measured for both, side by side, and the table
adds each row's ratio of this build to the other (`vs other`), so a change's cost is
read apart from how busy the machine was. The other build's libsandboxd.so must be
beside its binary (as `cargo build --release` leaves it).
"""

import argparse
import http.client
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from harness import BIN, Daemon, scratch_dir  # noqa: E402


class Api:
    """A lean HTTP/1.1 client: one keep-alive connection per thread (http.client;
    httpx alone adds ~0.5 ms a request, which is the client's cost, not sandboxd's)."""

    def __init__(self, port):
        self.port = port
        self.local = threading.local()

    def post(self, path, body):
        conn = getattr(self.local, "conn", None)
        if conn is None:
            conn = self.local.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        return r.status, r.read()


def interleaved(systems, runs, warmup=3, before=None, alternate=False):
    """p50/p95 in ms of each of `systems` ([(name, fn)]), measured in rounds: each
    round calls `before` (untimed), then each system once, in order (with
    `alternate`, in reverse order every other round: what one run leaves behind,
    a template's refill or a slot's teardown, then weighs on each system's
    neighbours alike). Whatever else this machine is doing weighs on every system
    alike."""
    samples = {name: [] for name, _ in systems}
    for i in range(warmup + runs):
        if before:
            before()
        for name, fn in (systems[::-1] if alternate and i % 2 else systems):
            t = time.perf_counter()
            fn()
            if i >= warmup:
                samples[name].append((time.perf_counter() - t) * 1000)
    out = []
    for name, _ in systems:
        s = sorted(samples[name])
        out.append((name, {"p50": statistics.median(s), "p95": s[min(len(s) - 1, int(len(s) * 0.95))]}))
    return out


WORKLOADS = [
    ("print(1)", "print(1)"),
    ("plot", "import io, numpy as np, pandas as pd, matplotlib.pyplot as plt\n"
             "df = pd.DataFrame({'x': np.arange(100), 'y': np.random.rand(100).cumsum()})\n"
             "df.plot(x='x', y='y')\nplt.savefig(io.BytesIO(), format='png')\nplt.close('all')"),
    ("1 MiB stdout", "import sys\nsys.stdout.write('x' * (1 << 20))"),
]
EXPECT = {"print(1)": b"1\n", "plot": b"", "1 MiB stdout": b"x" * (1 << 20)}


# The bare interpreter's whole environment (the same matplotlib setup as a sandbox).
BARE_ENV = {"PATH": "/opt/py/bin:/usr/bin:/bin", "MPLBACKEND": "Agg", "MPLCONFIGDIR": "/opt/sandboxd/mplconfig",
            "PYTHONDONTWRITEBYTECODE": "1"}


def check(cmd, expect=b"1\n"):
    out = subprocess.run(cmd, capture_output=True, env=BARE_ENV)
    if out.returncode != 0 or out.stdout != expect:
        raise SystemExit(f"{cmd[:3]}... failed: {out.returncode} {out.stdout!r} {out.stderr[-300:]!r}")


def throughput(run, sessions, total=160):
    """Runs per second with one concurrent client per session, `total` runs in all."""
    import concurrent.futures
    per = total // len(sessions)
    t = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(len(sessions)) as ex:
        list(ex.map(lambda s: [run(s) for _ in range(per)], sessions))
    return per * len(sessions) / (time.perf_counter() - t)


def metric_sums(daemon):
    """{(name, labels): value} of the `_sum` and `_count` samples of the daemon's
    /metrics (labels as the text has them)."""
    with daemon.uds() as c:
        text = c.get("/metrics").text
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        key, _, value = line.rpartition(" ")
        name, _, labels = key.partition("{")
        if name.endswith(("_sum", "_count")):
            out[(name, labels.rstrip("}"))] = float(value)
    return out


# The parts of a pooled run's time the daemon measures (`/metrics`), by histogram
# and labels; what they leave of the run's time in the daemon is its own work.
PHASES = [
    ("waiting for a template", "sandboxd_run_queue_wait_seconds", 'mode="pooled"'),
    ("workspace walk before", "sandboxd_run_workspace_walk_seconds", 'mode="pooled",when="before"'),
    ("attaching the workspace", "sandboxd_run_setup_seconds", 'mode="pooled"'),
    ("the program", "sandboxd_run_execution_seconds", 'mode="pooled"'),
    ("workspace walk after", "sandboxd_run_workspace_walk_seconds", 'mode="pooled",when="after"'),
]


def phases(daemon, run, pool_full, runs):
    """Where a pooled run's time goes, as means in ms over `runs` sequential runs
    (each on a full pool): the client's wall time, the daemon's whole time
    (`sandboxd_run_handling_seconds`) and its phases from /metrics."""
    walls = []
    before = metric_sums(daemon)
    for _ in range(runs):
        pool_full()
        t = time.perf_counter()
        run()
        walls.append((time.perf_counter() - t) * 1000)
    after = metric_sums(daemon)

    def mean(name, labels=""):
        n = after.get((f"{name}_count", labels), 0) - before.get((f"{name}_count", labels), 0)
        total = after.get((f"{name}_sum", labels), 0) - before.get((f"{name}_sum", labels), 0)
        return total / n * 1000 if n else float("nan")

    out = {"client wall time": statistics.mean(walls), "in the daemon": mean("sandboxd_run_handling_seconds")}
    for label, name, labels in PHASES:
        out[label] = mean(name, labels)
    return out


# A new kernel session's first cell, which uses pandas: the session made and the
# cell run, both timed, as a user meets it.
FIRST_CELL = "import pandas as pd\nprint(len(pd.DataFrame({'a': [1, 2]})))"


def first_cells(bare, cold, pooled, pool_full, runs):
    """A new kernel session and its first cell (`FIRST_CELL`), on the daemon with
    the pool off (the kernel's interpreter starts cold and imports pandas) and on
    the pooled one (the kernel starts in a fork of a template that imported it),
    against the same code in a bare Python. Sessions are closed between rounds,
    untimed."""
    made = []

    def first(client_api):
        client, api = client_api
        sid = client.post("/v1/sessions", json={"mode": "kernel"}).json()["id"]
        made.append((client, sid))
        Build.run(FIRST_CELL, api, sid)

    def before():
        while made:
            client, sid = made.pop()
            client.delete(f"/v1/sessions/{sid}")
        pool_full()

    name = "first pandas cell"
    systems = [
        (f"{name}: python, no isolation (baseline)", lambda: check([*bare, FIRST_CELL], b"2\n")),
        (f"{name}: sandboxd cold", lambda: first(cold)),
        (f"{name}: sandboxd pooled", lambda: first(pooled)),
    ]
    try:
        return interleaved(systems, max(5, runs // 4), before=before)
    finally:
        before()


def seccomp_load(loads=400):
    """What loading the seccomp filter costs a process, against a one-instruction
    allow-all filter, in one run (`sandboxd __seccomp-load-bench`: the daemon's
    real filter, compiled by libseccomp; medians of `loads` loads each, timed
    around the seccomp call in fresh forks, the two kinds taking turns)."""
    out = subprocess.run([str(BIN), "__seccomp-load-bench", str(loads)], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def isolation_cost(rounds=8):
    """What each kernel mechanism a sandbox is built of costs, apart (`sandboxd
    __isolation-cost`: each in fresh forks as root, the machine's CPU per fork with
    the kernel's later teardown, beyond a bare fork's, and the wall time of the
    step's own calls)."""
    out = subprocess.run([str(BIN), "__isolation-cost", str(rounds)], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def refill(restarts=3):
    """Seconds from a daemon's start (it holds sessions of a run before) to its pool
    full: every template the pool makes at start ready (issue 27: within 3 s)."""
    d = Daemon(scratch_dir("bench-refill-"))
    times = []
    try:
        d.start()
        with d.http() as c:
            sid = c.post("/v1/sessions", json={}).json()["id"]
            c.post("/v1/runs", json={"session_id": sid, "code": "print(1)"})
        d.wait_pool_ready()
        full = d.pool()["ready"]
        for _ in range(restarts):
            d.stop()
            t0 = time.perf_counter()
            d.start()
            healthy = time.perf_counter() - t0
            while d.pool()["ready"] < full:
                time.sleep(0.02)
            times.append((healthy, time.perf_counter() - t0))
    finally:
        d.stop()
        shutil.rmtree(d.base, ignore_errors=True)
    times.sort(key=lambda t: t[1])
    return {"templates": full, "restarts": restarts, "healthy_s": times[len(times) // 2][0], "full_s": times[len(times) // 2][1],
            "worst_full_s": times[-1][1]}


def pool_memory(daemon_pid):
    """The pool templates' cgroup charge split into process memory and page cache:
    the memory cgroups of the daemon's template interpreters (v1 or v2), or None."""
    def parent(pid):
        try:
            return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return 0

    cgroups = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if b"--template" not in open(f"/proc/{pid}/cmdline", "rb").read():
                continue
            lines = open(f"/proc/{pid}/cgroup").read().splitlines()
        except OSError:
            continue
        p = int(pid)
        while p > 1 and p != daemon_pid:
            p = parent(p)
        if p != daemon_pid:
            continue
        for line in lines:
            _, controllers, path = line.split(":", 2)
            if "memory" in controllers.split(","):
                cgroups.add(f"/sys/fs/cgroup/memory{path}")
            elif controllers == "" and not any(":memory:" in l or ",memory" in l for l in lines):
                cgroups.add(f"/sys/fs/cgroup{path}")
    # A template's own cgroup holds its forks too: count each tree once.
    tops = {c for c in cgroups if not any(c != o and c.startswith(o + "/") for o in cgroups)}
    total = {"anon": 0, "file": 0}
    for c in tops:
        try:
            fields = dict(line.split() for line in open(f"{c}/memory.stat") if len(line.split()) == 2)
        except OSError:
            return None
        total["anon"] += int(fields.get("total_rss", fields.get("anon", 0)))
        total["file"] += int(fields.get("total_cache", fields.get("file", 0)))
    return total if tops else None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=60)
    ap.add_argument("--json", action="store_true", help="print the rows as JSON too")
    ap.add_argument("--vs", metavar="SANDBOXD", help="another build's daemon binary, measured in the same rounds")
    ap.add_argument("--packages", action="store_true", help="measure package installs (needs the package index)")
    args = ap.parse_args()
    if args.vs:
        return versus(args)
    if args.packages:
        return packages(args)

    cold_daemon = Daemon(scratch_dir("bench-cold-"), args=["--pool-size", "0"]).start()
    daemon = Daemon(scratch_dir("bench-")).start()
    copy_base = scratch_dir("bench-rootfs-")
    extra = {}
    try:
        with daemon.http() as c, cold_daemon.http() as cold_c:
            # The baseline runs in a writable copy of the rootfs the daemon mounted
            # (its image is read-only, and the bare run has no tmpfs of its own for
            # matplotlib's cache): the same files, without isolation.
            rootfs = copy_base / "tree"
            subprocess.run(["cp", "-a", str(daemon.state / "mnt" / "rootfs") + "/.", str(rootfs)], check=True)
            sid = c.post("/v1/sessions", json={}).json()["id"]
            cold_sid = cold_c.post("/v1/sessions", json={}).json()["id"]
            kernel_sid = c.post("/v1/sessions", json={"mode": "kernel"}).json()["id"]

            api, cold_api = Api(daemon.port), Api(cold_daemon.port)

            def api_run(code, language="python", session=None, client=api):
                Build.run(code, client, session or sid, language)

            def cold_run(code, language="python"):
                api_run(code, language, session=cold_sid, client=cold_api)

            bare = [shutil.which("chroot") or "/usr/sbin/chroot", str(rootfs), "/opt/py/bin/python", "-c"]
            bwrap = [shutil.which("bwrap") or "bwrap", "--ro-bind", str(rootfs), "/", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
                     "--unshare-all", "--die-with-parent", "--clearenv", "--setenv", "MPLBACKEND", "Agg",
                     "--setenv", "MPLCONFIGDIR", "/opt/sandboxd/mplconfig", "/opt/py/bin/python", "-c"]
            # Each round starts (untimed) once the pool is full, and the pooled run
            # comes last: a template's recycling (reaping its fork, forking ahead of
            # the next run) then never shares the CPU with another system's run.
            pool_full = lambda: daemon.wait_pool_ready()  # noqa: E731
            # A kernel session keeps its imports: warm it once, as a user's first cell would.
            api_run("import numpy, pandas, matplotlib.pyplot", session=kernel_sid)
            results = []
            for workload, code in WORKLOADS:
                expect = EXPECT.get(workload)
                systems = [(f"{workload}: python, no isolation (baseline)", lambda code=code, e=expect: check([*bare, code], e))]
                if shutil.which("bwrap"):
                    systems.append((f"{workload}: bubblewrap", lambda code=code, e=expect: check([*bwrap, code], e)))
                systems += [
                    (f"{workload}: sandboxd cold", lambda code=code: cold_run(code)),
                    (f"{workload}: sandboxd kernel session", lambda code=code: api_run(code, session=kernel_sid)),
                    (f"{workload}: sandboxd pooled", lambda code=code: api_run(code)),
                ]
                runs = args.runs if workload != "plot" else max(5, args.runs // 4)
                measured = dict(interleaved(systems, runs, before=pool_full))
                # Printed as cold, pooled, kernel (measured with pooled last).
                late = {f"{workload}: sandboxd pooled": 1, f"{workload}: sandboxd kernel session": 2}
                results += sorted(measured.items(), key=lambda item: late.get(item[0], 0))
            results += interleaved([("isolation only: shell `true` via sandboxd", lambda: cold_run("true", "shell"))], args.runs)
            results += first_cells(bare, (cold_c, cold_api), (c, api), pool_full, args.runs)
            extra["pooled_phases"] = phases(daemon, lambda: api_run("print(1)"), pool_full, args.runs)

            pool = daemon.wait_pool_ready()
            extra["daemon_rss_mib"] = daemon.rss_kib() / 1024
            extra["pooled_sandbox_mib"] = pool["memory_bytes"] / max(1, pool["ready"]) / 2**20  # per idle template
            extra["pool_ready"] = pool["ready"]
            extra["pool_memory"] = pool_memory(daemon.proc.pid)
            cold_sessions = [cold_c.post("/v1/sessions", json={}).json()["id"] for _ in range(8)]
            sessions = [c.post("/v1/sessions", json={}).json()["id"] for _ in range(8)]
            extra["cold_rps"] = throughput(lambda s: api_run("print(1)", session=s, client=cold_api), cold_sessions)
            # The pool first gets half of the load, untimed, to grow to it (as
            # bench/load.py does): the row is the pool under load, not its growth.
            throughput(lambda s: api_run("print(1)", session=s), sessions, total=80)
            before = daemon.pool()
            extra["pooled_rps"] = throughput(lambda s: api_run("print(1)", session=s), sessions)
            after = daemon.pool()
            extra["pooled_hits"] = after["hits"] - before["hits"]
            extra["pooled_misses"] = after["misses"] - before["misses"]
    finally:
        for d in (daemon, cold_daemon):
            d.stop()
            shutil.rmtree(d.base, ignore_errors=True)
        shutil.rmtree(copy_base, ignore_errors=True)
    extra["seccomp_load"] = seccomp_load()
    extra["isolation_cost"] = isolation_cost()
    extra["refill"] = refill()

    print(f"\nsandboxd bench: {args.runs} runs each (plots: fewer), {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}\n")
    print(f"| {'workload: system':<50} | {'p50 ms':>7} | {'p95 ms':>7} | {'ratio to bare':>13} |")
    print(f"|{'-' * 52}|{'-' * 9}|{'-' * 9}|{'-' * 15}|")
    base = {}
    for name, r in results:
        workload = name.split(":")[0]
        if "no isolation" in name:
            base[workload] = r["p50"]
        ratio = f"{r['p50'] / base[workload]:13.2f}" if workload in base else f"{'-':>13}"
        print(f"| {name:<50} | {r['p50']:7.1f} | {r['p95']:7.1f} | {ratio} |")
    print(f"\nthroughput, print(1), 8 concurrent clients over HTTP, 160 runs (the pooled daemon after 80 untimed):")
    print(f"  sandboxd cold:   {extra['cold_rps']:6.1f} runs/s")
    served = extra["pooled_hits"] / max(1, extra["pooled_hits"] + extra["pooled_misses"])
    extra["pooled_from_templates_rps"] = extra["pooled_rps"] * served
    print(f"  sandboxd pooled: {extra['pooled_rps']:6.1f} runs/s "
          f"({extra['pooled_hits']} by templates: {extra['pooled_from_templates_rps']:.1f} pooled runs/s; "
          f"{extra['pooled_misses']} cold)")
    ph = extra["pooled_phases"]
    own = ph["in the daemon"] - sum(ph[label] for label, _, _ in PHASES)
    print(f"\nwhere a pooled print(1) goes, means over {args.runs} runs: {ph['client wall time']:.2f} ms at the client, "
          f"{ph['in the daemon']:.2f} ms of it in the daemon:")
    print("  " + "; ".join(f"{label} {ph[label]:.2f}" for label, _, _ in PHASES)
          + f"; the daemon's own (session lease, record, result) {own:.2f}; "
          f"outside the daemon (HTTP, JSON, the client) {ph['client wall time'] - ph['in the daemon']:.2f}")
    print(f"\nmemory: daemon {extra['daemon_rss_mib']:.0f} MiB RSS; each idle template with its waiting fork "
          f"{extra['pooled_sandbox_mib']:.0f} MiB (cgroup charge, {extra['pool_ready']} idle)")
    mem = extra["pool_memory"]
    if mem:
        print(f"  of which, over the whole pool: {mem['anon'] / 2**20:.0f} MiB process memory, {mem['file'] / 2**20:.0f} MiB page "
              f"cache (the read-only rootfs image's, charged to the template that read a file first, shared by all)")
    load = extra["seccomp_load"]
    ms = load["ms_per_load"]
    print(f"\nseccomp filter load ({load['loads']} loads each, median): the filter ({load['instructions']} instructions) "
          f"{ms['filter']:.3f} ms, a 1-instruction allow-all {ms['allow_all']:.3f} ms: "
          f"{ms['filter'] / ms['allow_all']:.1f}x, {ms['filter'] - ms['allow_all']:.3f} ms more per sandbox")
    cost = extra["isolation_cost"]
    print(f"\nwhat each isolation mechanism costs on this host, apart ({cost['forks_per_step']} forks each, as root; "
          f"CPU: the whole machine's per fork, the kernel's teardown included, beyond a bare fork's):")
    print(f"  | {'step':<42} | {'wall us':>8} | {'CPU ms':>7} |")
    for row in cost["steps"]:
        print(f"  | {row['step']:<42} | {row['wall_us']:8.1f} | {row['cpu_ms']:7.2f} |")
    r = extra["refill"]
    print(f"\nthe pool after a restart (a daemon holding a session; {r['restarts']} restarts, median): healthy "
          f"{r['healthy_s']:.2f} s after its start, its {r['templates']} templates ready {r['full_s']:.2f} s after it "
          f"(slowest {r['worst_full_s']:.2f} s)")
    if args.json:
        print(json.dumps({"rows": {name: r for name, r in results}, **extra}, indent=1))


class Build:
    """One build's pair of daemons (pool off, pool on) and a session in each, with a
    kernel session warmed as a user's first cell would."""

    def __init__(self, label, binary):
        self.label = label
        self.cold = Daemon(scratch_dir("bench-cold-"), args=["--pool-size", "0"], binary=binary).start()
        self.pooled = Daemon(scratch_dir("bench-"), binary=binary).start()
        self.cold_api, self.api = Api(self.cold.port), Api(self.pooled.port)
        with self.cold.http() as c:
            self.cold_sid = c.post("/v1/sessions", json={}).json()["id"]
        with self.pooled.http() as c:
            self.sid = c.post("/v1/sessions", json={}).json()["id"]
            self.kernel_sid = c.post("/v1/sessions", json={"mode": "kernel"}).json()["id"]
        self.run("import numpy, pandas, matplotlib.pyplot", self.api, self.kernel_sid)

    @staticmethod
    def run(code, api, session, language="python"):
        status, text = api.post("/v1/runs", {"code": code, "session_id": session, "language": language})
        if status != 200 or json.loads(text)["status"] != "ok":
            raise SystemExit(f"run failed: {text[:500]!r}")

    def systems(self, workload, code):
        return [
            (f"{workload}: cold, {self.label}", lambda: self.run(code, self.cold_api, self.cold_sid)),
            (f"{workload}: pooled, {self.label}", lambda: self.run(code, self.api, self.sid)),
            (f"{workload}: kernel session, {self.label}", lambda: self.run(code, self.api, self.kernel_sid)),
        ]

    def stop(self):
        for d in (self.cold, self.pooled):
            d.stop()
            shutil.rmtree(d.base, ignore_errors=True)


def versus(args):
    """This build against `args.vs`, row by row in the same rounds (see the module doc)."""
    builds = []
    try:
        builds = [Build("this build", BIN), Build("other build", Path(args.vs).resolve())]
        pools_full = lambda: [b.pooled.wait_pool_ready() for b in builds]  # noqa: E731
        rows = []
        for workload, code in WORKLOADS:
            systems = [s for b in builds for s in b.systems(workload, code)]
            runs = args.runs if workload != "plot" else max(5, args.runs // 4)
            rows += interleaved(systems, runs, before=pools_full, alternate=True)
        for b in builds:
            rows += interleaved([(f"shell `true`: cold, {b.label}",
                                  lambda b=b: b.run("true", b.cold_api, b.cold_sid, "shell"))], args.runs)
        rps = {}
        for b in builds:
            sessions = []
            with b.pooled.http() as c:
                sessions = [c.post("/v1/sessions", json={}).json()["id"] for _ in range(8)]
            rps[b.label] = throughput(lambda s, b=b: b.run("print(1)", b.api, s), sessions)
    finally:
        for b in builds:
            b.stop()
    measured = dict(rows)
    print(f"\nsandboxd bench --vs {args.vs}: {args.runs} runs each (plots: fewer), {os.cpu_count()} cores, "
          f"{time.strftime('%Y-%m-%d')}, both builds in the same rounds\n")
    print(f"| {'workload: system':<40} | {'this p50':>8} | {'other p50':>9} | {'vs other':>8} |")
    print(f"|{'-' * 42}|{'-' * 10}|{'-' * 11}|{'-' * 10}|")
    for name, r in rows:
        if not name.endswith(", this build"):
            continue
        row = name[: -len(", this build")]
        other = measured[f"{row}, other build"]
        print(f"| {row:<40} | {r['p50']:8.1f} | {other['p50']:9.1f} | {r['p50'] / other['p50']:8.2f} |")
    this, other = rps["this build"], rps["other build"]
    print(f"\nthroughput, print(1), 8 clients, pooled daemon: this {this:.1f} runs/s, other {other:.1f} runs/s: "
          f"{this / other:.2f}x")
    if args.json:
        print(json.dumps({"rows": measured, "rps": rps}, indent=1))


# The packages bench: a small pure-Python wheel with no dependencies.
PACKAGE, PACKAGE_VERSION = "tabulate", "0.9.0"


def packages(args):
    """Installs side by side (see the module's notes): rows of p50/p95 and the ratio
    to plain pip without isolation, in the same rounds."""
    runs = max(3, min(args.runs, 20))
    # The cache off: every install is a first one. The cache on: the first install
    # (untimed) fills it, and each timed one is a second session's.
    first_daemon = Daemon(scratch_dir("bench-pkg-first-"), args=["--package-cache-mb", "0"]).start()
    cached_daemon = Daemon(scratch_dir("bench-pkg-cached-")).start()
    copy_base = scratch_dir("bench-pkg-rootfs-")
    try:
        rootfs = copy_base / "tree"
        subprocess.run(["cp", "-a", str(first_daemon.state / "mnt" / "rootfs") + "/.", str(rootfs)], check=True)
        # The baseline trusts what the host trusts (a TLS-inspecting proxy's CA too).
        shutil.copy("/etc/ssl/certs/ca-certificates.crt", rootfs / "tmp" / "host-ca.pem")
        # ... and resolves names as the host does (the image's resolv.conf is empty:
        # sandboxes have no DNS, the proxy resolves for them).
        (rootfs / "etc" / "resolv.conf").unlink(missing_ok=True)
        shutil.copy("/etc/resolv.conf", rootfs / "etc" / "resolv.conf")
        chroot = shutil.which("chroot") or "/usr/sbin/chroot"
        env = {**BARE_ENV, "PIP_CERT": "/tmp/host-ca.pem", "PIP_NO_CACHE_DIR": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1",
               # Not the image's pip.conf, which installs into a session's layer (--prefix).
               "PIP_CONFIG_FILE": "/dev/null"}
        for k in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy"):
            if os.environ.get(k):
                env[k] = os.environ[k]
        wanted = f"{PACKAGE}=={PACKAGE_VERSION}"
        counter = iter(range(1 << 30))

        def pip_bare():
            target = f"/tmp/pip-target-{next(counter)}"
            out = subprocess.run([chroot, str(rootfs), "/opt/py/bin/python", "-m", "pip", "install", "--quiet",
                                  "--target", target, wanted], capture_output=True, env=env)
            if out.returncode != 0:
                raise SystemExit(f"pip install failed: {out.stderr[-500:]!r}")

        fresh = {}

        def new_sessions():
            for name, d in (("first", first_daemon), ("cached", cached_daemon)):
                with d.http() as c:
                    fresh[name] = c.post("/v1/sessions", json={}).json()["id"]

        def install(d, name):
            with d.http(timeout=300) as c:
                r = c.post(f"/v1/sessions/{fresh[name]}/packages", json={"packages": [wanted]})
            if r.status_code != 200 or not r.json()["installed"]:
                raise SystemExit(f"install failed: {r.text[:500]}")

        with cached_daemon.http(timeout=300) as c:
            warm = c.post("/v1/sessions", json={}).json()["id"]
            c.post(f"/v1/sessions/{warm}/packages", json={"packages": [wanted]})
        rows = interleaved([
            (f"install {PACKAGE}: pip, no isolation (baseline)", pip_bare),
            (f"install {PACKAGE}: sandboxd, first install", lambda: install(first_daemon, "first")),
            (f"install {PACKAGE}: sandboxd, a second session's", lambda: install(cached_daemon, "cached")),
        ], runs, warmup=1, before=new_sessions)

        # Importing it: bare (from the pip target), cold (a shell run), pooled.
        target = "/tmp/pip-target-import"
        subprocess.run([chroot, str(rootfs), "/opt/py/bin/python", "-m", "pip", "install", "--quiet", "--target", target,
                        wanted], check=True, capture_output=True, env=env)
        code = f"import {PACKAGE}"
        api = Api(cached_daemon.port)
        rows += interleaved([
            (f"import {PACKAGE}: python, no isolation (baseline)",
             lambda: check([chroot, str(rootfs), "/opt/py/bin/python", "-c", f"import sys; sys.path.append({target!r}); {code}"], b"")),
            (f"import {PACKAGE}: sandboxd cold", lambda: Build.run(f"python -c '{code}'", api, warm, "shell")),
            (f"import {PACKAGE}: sandboxd pooled", lambda: Build.run(code, api, warm)),
        ], runs * 2, before=lambda: cached_daemon.wait_pool_ready())
    finally:
        for d in (first_daemon, cached_daemon):
            d.stop()
            shutil.rmtree(d.base, ignore_errors=True)
        shutil.rmtree(copy_base, ignore_errors=True)
    print(f"\nsandboxd packages bench: {runs} installs each, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}\n")
    print(f"| {'workload: system':<50} | {'p50 ms':>7} | {'p95 ms':>7} | {'ratio to bare':>13} |")
    print(f"|{'-' * 52}|{'-' * 9}|{'-' * 9}|{'-' * 15}|")
    base = {}
    for name, r in rows:
        workload = name.split(":")[0]
        if "no isolation" in name:
            base[workload] = r["p50"]
        print(f"| {name:<50} | {r['p50']:7.1f} | {r['p95']:7.1f} | {r['p50'] / base[workload]:13.2f} |")
    if args.json:
        print(json.dumps({"rows": dict(rows)}, indent=1))


if __name__ == "__main__":
    main()
