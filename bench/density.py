#!/usr/bin/env python3
"""Density: many idle sessions of the default policy held by one daemon.

    sudo target/test-venv/bin/python bench/density.py [--sessions 10000] [--step 1000]

(after `make bench` once, which builds the daemon, the rootfs and the venv.)

One daemon with the default policy (policies/default.toml: a 1 GiB workspace and a
512 MiB package layer per session), `--max-sessions` as asked and
`--workspace-overcommit` high enough for them all. Sessions are created one after
another over a keep-alive HTTP connection; for each step of `--step` sessions the
row gives the creates per second and their p50 and p95, the daemon's resident
memory, the mounts below the sessions' directory and the disk the state directory
took. The ratio column is each step's p50 over the first step's: flat is 1.0.

Then runs, side by side: `print(1)` in the first session made and in the last
(each's first run, which makes and mounts its workspace, then its second), and in
a session of a daemon that holds one session only (the baseline); ratios are over
the baseline's.
"""

import argparse
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from harness import Daemon, _uids_in_use, scratch_dir  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def percentile(samples, q):
    s = sorted(samples)
    return s[min(len(s) - 1, int(len(s) * q))]


def mounts_below(d, path):
    prefix = str(path) + "/"
    return sum(1 for line in d.mountinfo().splitlines() if line.split(" ")[4].startswith(prefix))


def disk_used(path):
    total = 0
    for p in path.rglob("*"):
        try:
            total += p.lstat().st_blocks * 512
        except FileNotFoundError:
            pass
    return total


def uid_base(span):
    for base in range(3_000_000, 6_000_000, 20_000):
        if not _uids_in_use(base, span):
            return base
    raise SystemExit("no free uid range")


def first_runs(c, sid, runs=2):
    """Wall times (ms) of the session's first `runs` runs of print(1)."""
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        r = c.post(f"/v1/sessions/{sid}/runs", json={"code": "print(1)"}).json()
        times.append((time.perf_counter() - t) * 1000)
        if r.get("stdout") != "1\n":
            raise SystemExit(f"run failed: {r}")
    return times


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=9_990, help="sessions held (max_sessions is 10,000 at most, "
                    "and --rounds more are made for the runs)")
    ap.add_argument("--step", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=5, help="sessions measured per system for the runs")
    args = ap.parse_args()
    policy = (REPO / "policies" / "default.toml").read_text()
    dense = Daemon(scratch_dir("bench-density-"), policies={"default": policy},
                   args=["--max-sessions", str(args.sessions + args.rounds), "--workspace-overcommit", "1000"])
    dense.uid_base = uid_base(args.sessions + args.rounds + 256)
    single = Daemon(scratch_dir("bench-density-one-"), policies={"default": policy})
    try:
        dense.start()
        single.start()
        sessions = dense.state / "sessions"
        print(f"{'sessions':>9} {'creates/s':>10} {'p50 ms':>7} {'p95 ms':>7} {'ratio':>6} "
              f"{'RSS MiB':>8} {'mounts':>7} {'disk MiB':>9}")
        made = []
        first_p50 = None
        with dense.http() as c:
            while len(made) < args.sessions:
                times = []
                t0 = time.perf_counter()
                for _ in range(min(args.step, args.sessions - len(made))):
                    t = time.perf_counter()
                    r = c.post("/v1/sessions", json={})
                    times.append((time.perf_counter() - t) * 1000)
                    if r.status_code != 201:
                        raise SystemExit(f"create {len(made) + 1} failed: {r.status_code} {r.text}")
                    made.append(r.json()["id"])
                rate = len(times) / (time.perf_counter() - t0)
                p50 = statistics.median(times)
                first_p50 = first_p50 or p50
                print(f"{len(made):>9} {rate:>10.0f} {p50:>7.2f} {percentile(times, 0.95):>7.2f} "
                      f"{p50 / first_p50:>6.2f} {dense.rss_kib() / 1024:>8.1f} {mounts_below(dense, sessions):>7} "
                      f"{disk_used(sessions) / 2**20:>9.1f}", flush=True)
            # The runs: each system's sessions measured in turn.
            extra = [c.post("/v1/sessions", json={}).json()["id"] for _ in range(args.rounds)]
            with single.http() as s:
                rows = {"alone (1 session held)": [], f"first of {args.sessions}": [],
                        f"last of {args.sessions}": [], "new, beside them": []}
                for i in range(args.rounds):
                    # Each daemon's pool full, as on an idle service.
                    single.wait_pool_ready()
                    dense.wait_pool_ready()
                    alone = s.post("/v1/sessions", json={}).json()["id"]
                    rows["alone (1 session held)"].append(first_runs(s, alone))
                    s.delete(f"/v1/sessions/{alone}")
                    rows[f"first of {args.sessions}"].append(first_runs(c, made[i]))
                    rows[f"last of {args.sessions}"].append(first_runs(c, made[-1 - i]))
                    rows["new, beside them"].append(first_runs(c, extra[i]))
        base = [statistics.median(r[k] for r in rows["alone (1 session held)"]) for k in (0, 1)]
        print(f"\n{'print(1) in a session':<24} {'1st run p50':>12} {'ratio':>6} {'2nd run p50':>12} {'ratio':>6}")
        for name, runs in rows.items():
            p = [statistics.median(r[k] for r in runs) for k in (0, 1)]
            print(f"{name:<24} {p[0]:>10.1f}ms {p[0] / base[0]:>6.2f} {p[1]:>10.1f}ms {p[1] / base[1]:>6.2f}")
        print(f"\nmounts below the sessions now: {mounts_below(dense, sessions)} "
              f"(each used session's until workspace_idle_unmount_s)")
    finally:
        for d in (dense, single):
            d.stop()
            shutil.rmtree(d.base, ignore_errors=True)


if __name__ == "__main__":
    main()
