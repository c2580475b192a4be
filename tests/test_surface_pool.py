"""The daemon's own surface, in the pool: what forks of one template share is bounded.

Every fork of a template shares its Python hash secret and memory layout (ASLR):
a template serves at most its policy's `template_runs` runs, then a new one (a
new secret, a new layout) takes its place."""

import time

import pytest

POLICY = """
description = "A template serves two runs."
preload = []
template_runs = 2
"""

# What a fork shares with its template: the str hash secret, and where libc is
# mapped (Debian's python3.11 itself is not position-independent: it is always at
# the same address, in every process).
SECRETS = r"""
import json
maps = open("/proc/self/maps").read().splitlines()
libc = next(l.split("-")[0] for l in maps if "libc.so" in l)
print(json.dumps([hash("sandboxd"), libc]))
"""


def pooled(daemon, policy):
    """One run of SECRETS from a ready template of `policy` (asserted by the counters)."""
    deadline = time.time() + 60
    while daemon.pool()["ready_by_policy"].get(policy, 0) < 1:
        assert time.time() < deadline, daemon.pool()
        time.sleep(0.05)
    before = daemon.pool()["hits"]
    r = daemon.run(SECRETS, policy=policy)
    assert r["status"] == "ok", r
    assert daemon.pool()["hits"] == before + 1
    return tuple(__import__("json").loads(r["stdout"]))


@pytest.fixture
def two_runs_daemon(fresh_daemon):
    # One template per policy, so that consecutive runs meet the same one.
    return fresh_daemon(policies={"tworuns": POLICY}, args=["--pool-size", "1"])


def test_a_template_serves_at_most_its_policys_runs(two_runs_daemon):
    d = two_runs_daemon
    d.run("print(1)", policy="tworuns")  # the policy is in use from now on: the pool keeps it
    first = [pooled(d, "tworuns") for _ in range(2)]
    # Two runs from one template: the same secret and layout (what the bound is for).
    assert first[0] == first[1], first
    second = [pooled(d, "tworuns") for _ in range(2)]
    # The third run is from a new template: nothing of the first is shared.
    assert second[0] == second[1], second
    assert second[0][0] != first[0][0], (first, second)
    assert second[0][1] != first[0][1], (first, second)
    d.assert_clean()


def test_a_policy_refuses_a_bad_template_runs(fresh_daemon, tmp_path):
    with pytest.raises(RuntimeError) as e:
        fresh_daemon(policies={"bad": "template_runs = 0\n"})
    assert "field `template_runs` is 0; allowed: a whole number from 1 to 1000000" in str(e.value)
