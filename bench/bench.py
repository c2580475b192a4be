#!/usr/bin/env python3
"""Side-by-side timings, measured in one run on this machine.

    make bench            (or: python3 bench/bench.py [--runs N])

Each row runs the same workload N times and reports p50/p95 wall time and the
ratio of its p50 to the baseline's: the rootfs's own Python with no isolation
(`chroot ROOTFS /opt/py/bin/python`). sandboxd rows go through the real HTTP API,
so they include HTTP, the fresh namespaces, cgroup, Landlock and seccomp, the
workspace scan for artifacts and the result.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from harness import Daemon, scratch_dir  # noqa: E402


def timed(fn, runs, warmup=3):
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t) * 1000)
    samples.sort()
    return {"p50": statistics.median(samples), "p95": samples[min(len(samples) - 1, int(len(samples) * 0.95))]}


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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--json", action="store_true", help="print the rows as JSON too")
    args = ap.parse_args()

    daemon = Daemon(scratch_dir("bench-")).start()
    try:
        with daemon.http() as c:
            health = c.get("/v1/health").json()
            rootfs = daemon.state / "rootfs" / health["rootfs_sha256"]
            sid = c.post("/v1/sessions", json={}).json()["id"]

            kernel_sid = c.post("/v1/sessions", json={"mode": "kernel"}).json()["id"]

            def api_run(code, language="python", session=None):
                r = c.post("/v1/runs", json={"code": code, "session_id": session or sid, "language": language})
                body = r.json()
                if r.status_code != 200 or body["status"] != "ok":
                    raise SystemExit(f"run failed: {r.text[:500]}")

            bare = [shutil.which("chroot") or "/usr/sbin/chroot", str(rootfs), "/opt/py/bin/python", "-c"]
            bwrap = [shutil.which("bwrap") or "bwrap", "--ro-bind", str(rootfs), "/", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
                     "--unshare-all", "--die-with-parent", "--clearenv", "--setenv", "MPLBACKEND", "Agg",
                     "--setenv", "MPLCONFIGDIR", "/opt/sandboxd/mplconfig", "/opt/py/bin/python", "-c"]
            rows = []
            for workload, code in WORKLOADS:
                expect = EXPECT.get(workload)
                rows.append((f"{workload}: python, no isolation (baseline)", lambda code=code, e=expect: check([*bare, code], e)))
                if shutil.which("bwrap"):
                    rows.append((f"{workload}: bubblewrap", lambda code=code, e=expect: check([*bwrap, code], e)))
                rows.append((f"{workload}: sandboxd via HTTP", lambda code=code: api_run(code)))
                rows.append((f"{workload}: sandboxd kernel session", lambda code=code: api_run(code, session=kernel_sid)))
            rows.append(("isolation only: shell `true` via sandboxd", lambda: api_run("true", "shell")))

            # A kernel session keeps its imports: warm it once, as a user's first cell would.
            api_run("import numpy, pandas, matplotlib.pyplot", session=kernel_sid)
            results = []
            for name, fn in rows:
                results.append((name, timed(fn, args.runs if not name.startswith("plot") else max(5, args.runs // 4))))
    finally:
        daemon.stop()
        shutil.rmtree(daemon.base, ignore_errors=True)

    print(f"\nsandboxd bench: {args.runs} runs each (plots: fewer), {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}\n")
    print(f"| {'workload: system':<46} | {'p50 ms':>7} | {'p95 ms':>7} | {'ratio to bare':>13} |")
    print(f"|{'-' * 48}|{'-' * 9}|{'-' * 9}|{'-' * 15}|")
    base = {}
    for name, r in results:
        workload = name.split(":")[0]
        if "no isolation" in name:
            base[workload] = r["p50"]
        ratio = f"{r['p50'] / base[workload]:13.2f}" if workload in base else f"{'-':>13}"
        print(f"| {name:<46} | {r['p50']:7.1f} | {r['p95']:7.1f} | {ratio} |")
    if args.json:
        print(json.dumps({name: r for name, r in results}, indent=1))


if __name__ == "__main__":
    main()
