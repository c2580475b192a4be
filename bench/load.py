#!/usr/bin/env python3
"""Speed under concurrency, side by side in one run on this machine.

    sudo target/test-venv/bin/python bench/load.py [--clients 8] [--rounds 2] [--only plot]

(after `make bench` once, which builds the daemon, the rootfs and the venv.)

Each workload keeps `--clients` clients busy at once, for the same number of runs,
on three systems measured in turn (in reverse order every other round, so that what
the machine does meanwhile weighs on all alike):

  - bare: the rootfs's own Python with no isolation (`chroot ROOTFS python -c`),
    one process per run, `--clients` at a time (the baseline);
  - pool off: a daemon with `--pool-size 0`, every run a cold sandbox;
  - pooled: a daemon with its default pool.

Each sandboxd client has a session of its own and a keep-alive HTTP connection.
Before the timed rounds of a workload, the pooled daemon gets half a round of the
same load, untimed, so that its pool has grown to the load as under a sustained one.
A row reports runs per second, p50 and p95 of each run's wall time as its client
saw it, the ratio of its runs per second to bare's, and, for the pooled daemon,
the share of its runs its templates served (the pool's hit counter, read before
and after) and how many templates it held at the end.

Workloads: `print(1)`; a plot (numpy, pandas, matplotlib, as bench.py's); and a
mix in which each client goes round print(1), a pandas computation and the plot.
"""

import argparse
import concurrent.futures
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from bench import BARE_ENV, WORKLOADS, Api, Build  # noqa: E402
from harness import Daemon, scratch_dir  # noqa: E402

PRINT = dict(WORKLOADS)["print(1)"]
PLOT = dict(WORKLOADS)["plot"]
COMPUTE = ("import numpy as np, pandas as pd\n"
           "df = pd.DataFrame({'k': np.arange(10000) % 7, 'v': np.random.rand(10000)})\n"
           "print(df.groupby('k').v.mean().round(3).to_dict())")
# Per workload: the codes each client goes round, and how many runs each client makes.
LOADS = {
    "print(1)": ([PRINT], 40),
    "plot": ([PLOT], 6),
    "mixed": ([PRINT, COMPUTE, PLOT], 9),
}


def percentile(samples, q):
    s = sorted(samples)
    return s[min(len(s) - 1, int(len(s) * q))]


def drive(clients, per_client, run):
    """`clients` threads, each calling run(client, i) `per_client` times; the wall
    time of the whole and of each call (ms)."""
    def client(c):
        times = []
        for i in range(per_client):
            t = time.perf_counter()
            run(c, i)
            times.append((time.perf_counter() - t) * 1000)
        return times

    t = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as ex:
        times = [x for per in ex.map(client, range(clients)) for x in per]
    return time.perf_counter() - t, times


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2, help="rounds per workload (each system once per round)")
    ap.add_argument("--only", choices=sorted(LOADS), action="append", help="measure only these workloads")
    ap.add_argument("--log", metavar="FILE", help="keep the pooled daemon's log there")
    ap.add_argument("--template-runs", type=int, metavar="N",
                    help="the pooled daemon's default policy with template_runs = N (what retiring templates costs)")
    args = ap.parse_args()

    off = Daemon(scratch_dir("bench-load-off-"), args=["--pool-size", "0"]).start()
    policies = None
    if args.template_runs is not None:
        text = (Path(__file__).resolve().parents[1] / "policies" / "default.toml").read_text()
        text, n = re.subn(r"(?m)^template_runs = \d+$", f"template_runs = {args.template_runs}", text)
        if n != 1:
            raise SystemExit("policies/default.toml has no `template_runs = N` line to change")
        policies = {"default": text}
    pooled = Daemon(scratch_dir("bench-load-"), policies=policies).start()
    copy_base = scratch_dir("bench-load-rootfs-")
    rows = {}
    try:
        rootfs = copy_base / "tree"
        subprocess.run(["cp", "-a", str(pooled.state / "mnt" / "rootfs") + "/.", str(rootfs)], check=True)
        bare_cmd = [shutil.which("chroot") or "/usr/sbin/chroot", str(rootfs), "/opt/py/bin/python", "-c"]
        apis = {"off": Api(off.port), "pooled": Api(pooled.port)}
        sessions = {}
        for name, d in (("off", off), ("pooled", pooled)):
            with d.http() as c:
                sessions[name] = [c.post("/v1/sessions", json={}).json()["id"] for _ in range(args.clients)]

        def bare(codes):
            def run(c, i):
                out = subprocess.run([*bare_cmd, codes[(c + i) % len(codes)]], capture_output=True, env=BARE_ENV)
                if out.returncode != 0:
                    raise SystemExit(f"bare run failed: {out.stderr[-300:]!r}")
            return run

        def daemon(name, codes):
            def run(c, i):
                Build.run(codes[(c + i) % len(codes)], apis[name], sessions[name][c])
            return run

        for workload, (codes, per_client) in LOADS.items():
            if args.only and workload not in args.only:
                continue
            systems = [("bare", bare(codes)), ("pool off", daemon("off", codes)), ("pooled", daemon("pooled", codes))]
            acc = {name: {"seconds": 0.0, "times": [], "hits": 0, "misses": 0, "failures": 0} for name, _ in systems}
            # Untimed: a run per client for the page cache; for the pooled daemon, half
            # a round of the same load, so that its pool has grown to it, as under a
            # sustained load (growing costs a template's imports per template).
            for name, run in systems:
                drive(args.clients, max(1, per_client // 2) if name == "pooled" else 1, run)
            for r in range(args.rounds):
                for name, run in systems[::-1] if r % 2 else systems:
                    pooled.wait_pool_ready()
                    before = pooled.pool()
                    seconds, times = drive(args.clients, per_client, run)
                    after = pooled.pool()
                    a = acc[name]
                    a["seconds"] += seconds
                    a["times"] += times
                    if name == "pooled":
                        a["hits"] += after["hits"] - before["hits"]
                        a["misses"] += after["misses"] - before["misses"]
                        a["failures"] += after["failures"] - before["failures"]
                        a["templates"] = after.get("templates", after["ready"] + after["busy"])
            for name, a in acc.items():
                rows[(workload, name)] = {
                    "rps": len(a["times"]) / a["seconds"],
                    "p50": statistics.median(a["times"]),
                    "p95": percentile(a["times"], 0.95),
                    "pooled": a["hits"] / max(1, a["hits"] + a["misses"]) if name == "pooled" else None,
                    "templates": a.get("templates"),
                    "failures": a["failures"],
                }
        if args.log:
            shutil.copyfile(pooled.log_path, args.log)
    finally:
        for d in (pooled, off):
            d.stop()
            shutil.rmtree(d.base, ignore_errors=True)
        shutil.rmtree(copy_base, ignore_errors=True)

    print(f"\nsandboxd load bench: {args.clients} concurrent clients, {args.rounds} rounds, "
          f"{os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}\n")
    print(f"| {'workload: system':<22} | {'runs/s':>7} | {'x bare':>6} | {'p50 ms':>7} | {'p95 ms':>7} | {'pooled':>6} | {'templates':>9} | {'failures':>8} |")
    print(f"|{'-' * 24}|{'-' * 9}|{'-' * 8}|{'-' * 9}|{'-' * 9}|{'-' * 8}|{'-' * 11}|{'-' * 10}|")
    for (workload, name), r in rows.items():
        base = rows[(workload, "bare")]["rps"]
        share = f"{r['pooled'] * 100:5.0f}%" if r["pooled"] is not None else f"{'-':>6}"
        templates = f"{r['templates']:>9}" if r["templates"] is not None else f"{'-':>9}"
        failures = f"{r['failures']:>8}" if r["pooled"] is not None else f"{'-':>8}"
        print(f"| {workload + ': ' + name:<22} | {r['rps']:7.1f} | {r['rps'] / base:6.2f} | {r['p50']:7.1f} | "
              f"{r['p95']:7.1f} | {share} | {templates} | {failures} |")


if __name__ == "__main__":
    main()
